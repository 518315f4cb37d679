"""``sendstream backup``: the nightly flow on a host, from one TOML file (:mod:`.config`): take read-only
snapshots, send each target what it lacks from the newest parent it holds, keep what the policies say.
The decisions are pure (:mod:`.plan`); :mod:`.run` owns the subvolumes, the targets and the lock."""
