"""``sendstream backup``'s plan (pure) and configuration: the parent chosen by UUID, what each target
lacks, full rotation, what targets pin, the status; and nightly runs over random histories on a
simulated clock, with targets that fail at random."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendstream import errors as e
from sendstream.backup.config import DEFAULT_LOCK, load
from sendstream.backup.plan import (
    Held,
    Local,
    Rotation,
    common,
    local_kept,
    pins,
    rotation,
    sends,
    snapshot_name,
    standing,
)
from sendstream.retention import KEEP_ALL, policy

UTC = dt.UTC
START = dt.datetime(2026, 11, 1, 1, 30, tzinfo=UTC)
P = policy(tz=UTC)  # keeps everything; times in UTC


def local(n: int, start: dt.datetime = START) -> list[Local]:
    return [Local(f"home.{i:03d}", f"u{i}", None, start + dt.timedelta(days=i)) for i in range(n)]


def held_chain(snapshots: list[Local], full_at: int = 0) -> list[Held]:
    """What a target holds that got ``snapshots`` in order, the first whole and each from the one before."""
    return [
        Held(s.uuid, None if i == full_at else snapshots[i - 1].uuid, s.name, s.time) for i, s in enumerate(snapshots)
    ]


def test_a_target_that_holds_nothing_gets_the_oldest_whole_and_every_later_one() -> None:
    mine = local(3)
    assert [(s.snapshot, s.parent) for s in sends(mine, [], START, P)] == [
        ("home.000", None),
        ("home.001", "home.000"),
        ("home.002", "home.001"),
    ]
    assert sends([], [], START, P) == []


def test_each_snapshot_a_target_lacks_goes_from_the_one_before_in_order() -> None:
    mine = local(5)
    plan = sends(mine, held_chain(mine[:2]), START, P)
    assert [(s.snapshot, s.parent) for s in plan] == [
        ("home.002", "home.001"),
        ("home.003", "home.002"),
        ("home.004", "home.003"),
    ]
    assert sends(mine, held_chain(mine), START, P) == []  # all held: nothing goes


def test_the_parent_is_the_newest_held_even_when_older_ones_are_gone_from_the_target() -> None:
    mine = local(4)
    held = [Held("u1", None, "home.001", None), Held("other", None, "x.20261101", None)]
    assert common(mine, held) == mine[1]
    assert [(s.snapshot, s.parent) for s in sends(mine, held, START, P)] == [
        ("home.002", "home.001"),
        ("home.003", "home.002"),
    ]


def test_a_local_snapshot_that_was_received_is_matched_by_its_received_uuid() -> None:
    mine = [Local("home.000", "local-a", "sent-a", START), Local("home.001", "local-b", None, START)]
    held = [Held("sent-a", None, "home.000", None)]
    assert common(mine, held) == mine[0]
    assert [(s.snapshot, s.parent) for s in sends(mine, held, START, P)] == [("home.001", "home.000")]


def test_full_rotation_by_chain_length() -> None:
    mine = local(8)
    now = mine[-1].time
    plan = sends(mine, held_chain(mine[:2]), now, P, Rotation(length=3))
    # held: a full and 1 incremental; 2 more make the chain 3, then a full, then incrementals on it
    assert [(s.snapshot, s.parent) for s in plan] == [
        ("home.002", "home.001"),
        ("home.003", "home.002"),
        ("home.004", None),
        ("home.005", "home.004"),
        ("home.006", "home.005"),
        ("home.007", "home.006"),
    ]
    assert "full rotation" in plan[2].why


def test_full_rotation_by_age_counts_from_the_full_stream_s_snapshot() -> None:
    mine = local(12)
    now = mine[-1].time
    plan = sends(mine, held_chain(mine[:10]), now, P, Rotation(age=dt.timedelta(days=7)))
    assert [(s.snapshot, s.parent) for s in plan] == [("home.010", None), ("home.011", "home.010")]
    young = sends(mine, held_chain(mine[:10], full_at=5), now, P, Rotation(age=dt.timedelta(days=7)))
    assert [(s.snapshot, s.parent) for s in young] == [("home.010", "home.009"), ("home.011", "home.010")]


@pytest.mark.parametrize(("value", "expected"), [(10, Rotation(length=10)), ("30d", Rotation(age=dt.timedelta(30)))])
def test_full_every_reads_a_length_or_an_age(value: object, expected: Rotation) -> None:
    assert rotation(value) == expected


@pytest.mark.parametrize("value", [0, -1, True, "30", "30x", "d", 1.5, "0d"])
def test_a_bad_full_every_says_what_was_expected(value: object) -> None:
    with pytest.raises(e.BadPolicy, match=r"full_every = .*: expected a chain length"):
        rotation(value)


def test_a_target_pins_its_newest_and_every_newer_one_it_lacks() -> None:
    mine = local(5)
    got = pins(mine, held_chain(mine[:2]), "nas")
    assert set(got) == {"home.001", "home.002", "home.003", "home.004"}
    assert "next parent" in got["home.001"] and got["home.003"] == "not yet on nas"
    assert set(pins(mine, [], "nas")) == {s.name for s in mine}  # it holds none: all may be needed


def test_local_retention_keeps_what_a_target_needs_whatever_the_policy() -> None:
    mine = local(10)
    now = mine[-1].time
    keep_one = policy("1d", "no", tz=UTC)
    alone = {d.key for d in local_kept(mine, keep_one, now, {}) if d.keep}
    assert alone == {"home.008", "home.009"}  # btrbk's 1d: today's and yesterday's first
    kept = [d.key for d in local_kept(mine, keep_one, now, pins(mine, held_chain(mine[:3]), "nas")) if d.keep]
    assert kept == [s.name for s in mine[2:]]
    kept = [d.key for d in local_kept(mine, keep_one, now, pins(mine, held_chain(mine), "nas")) if d.keep]
    assert kept == ["home.008", "home.009"]


def test_a_snapshot_name_taken_in_the_same_minute_gets_a_number() -> None:
    now = dt.datetime(2026, 12, 4, 1, 30, 59).astimezone()
    assert snapshot_name("home", now, []) == "home.20261204T0130"
    assert snapshot_name("home", now, ["home.20261204T0130"]) == "home.20261204T0130_1"
    assert snapshot_name("home", now, ["home.20261204T0130", "home.20261204T0130_1"]) == "home.20261204T0130_2"
    assert snapshot_name("home", now, ["home.20261204T0130", "home.20261204T0130_2"]) == "home.20261204T0130_3"
    assert snapshot_name("home", now, ["home.20261204T0130_9", "home.20261204T01301"]) == "home.20261204T0130_10"


def test_status_says_the_newest_held_its_age_and_chain_and_whether_it_is_behind() -> None:
    mine = local(5)
    now = mine[-1].time + dt.timedelta(hours=1)
    held = held_chain(mine[:3])
    where = standing(mine, held, now, P, None, dt.timedelta(days=1), "home")
    assert (where.last, where.chain, where.age) == ("home.002", 2, dt.timedelta(days=2, hours=1))
    assert where.stale and [s.snapshot for s in where.next] == ["home.003", "home.004"]
    assert not standing(mine, held, now, P, None, dt.timedelta(days=3), "home").stale
    none = standing(mine, [], now, P, None, None, "home")
    assert none.last is None and none.stale


# -- nightly runs on a simulated clock ----------------------------------------------------------------


OK, LAST_FAILS, DOWN = range(3)


class Target:
    """A target as the plan sees it: what it holds; a send fails when the run says so."""

    def __init__(self, full_every: Rotation | None) -> None:
        self.held: list[Held] = []
        self.full_every = full_every

    def take(self, send_parent: Local | None, snapshot: Local) -> None:
        if send_parent is not None:
            assert send_parent.uuid in {h.uuid for h in self.held}, "an incremental from a parent it lacks"
        self.held.append(Held(snapshot.uuid, send_parent.uuid if send_parent else None, snapshot.name, None))


@settings(max_examples=60, deadline=None)
@given(
    days=st.integers(10, 70),
    fails=st.lists(st.sampled_from([OK, OK, LAST_FAILS, DOWN]), min_size=140, max_size=140),
    preserve=st.sampled_from(["1d", "3d 2w", "7d 4w *m", "2d"]),
    length=st.sampled_from([None, 3, 10]),
)
def test_nightly_runs_never_lose_a_parent_and_catch_up_after_failures(
    days: int, fails: list[int], preserve: str, length: int | None
) -> None:
    """Each night: a snapshot, each target sent what it lacks (one that fails stops before its last send,
    one that is down takes none, for days on end),
    the host's snapshots kept by the policy and what the targets pin. Every incremental's parent is on
    its target and on the host; a chain never grows past full_every; a target that succeeds holds the
    newest snapshot; no snapshot is sent to a target twice."""
    p = policy(preserve, "no", tz=UTC)
    targets = {"nas": Target(None), "bucket": Target(Rotation(length=length) if length else None)}
    host: list[Local] = []
    for day in range(days):
        now = START + dt.timedelta(days=day)
        host.append(Local(snapshot_name("home", now, (s.name for s in host)), str(uuid.uuid4()), None, now))
        pinned: dict[str, str] = {}
        for i, (name, target) in enumerate(targets.items()):
            by_name = {s.name: s for s in host}
            plan = sends(host, target.held, now, p, target.full_every)
            failing = fails[(2 * day + i) % len(fails)]
            for n, send in enumerate(plan):
                if failing == DOWN or (failing == LAST_FAILS and n == len(plan) - 1):
                    break  # the next night catches up
                target.take(by_name[send.parent] if send.parent else None, by_name[send.snapshot])
            if failing == OK:
                assert target.held[-1].uuid == host[-1].uuid
            pinned.update(pins(host, target.held, name))
        kept = {d.key for d in local_kept(host, p, now, pinned) if d.keep}
        host = [s for s in host if s.name in kept]
        for name, target in targets.items():
            base = common(host, target.held)
            assert target.held == [] or base is not None, f"{name}'s next parent was deleted"
            uuids = [h.uuid for h in target.held]
            assert len(uuids) == len(set(uuids)), "a snapshot sent twice"
            if target.full_every and target.full_every.length:
                by_uuid = {h.uuid: h for h in target.held}
                for h in target.held:
                    depth, at = 0, h
                    while at.parent_uuid:
                        depth, at = depth + 1, by_uuid[at.parent_uuid]
                    assert depth <= target.full_every.length


# -- the configuration --------------------------------------------------------------------------------


def write_config(tmp_path: Path, text: str) -> str:
    (tmp_path / "web1.key").write_bytes(bytes(range(32)))
    (tmp_path / "web1.key").chmod(0o600)
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "usb").mkdir(exist_ok=True)
    (tmp_path / "snaps").mkdir(exist_ok=True)
    path = tmp_path / "backup.toml"
    path.write_text(text)
    return str(path)


GOOD = """
preserve = "14d"

[subvolumes.home]
path = "home"
targets = ["nas", "usb"]

[subvolumes.srv]
path = "home"
snapshots = "snaps"
preserve = "2d"

[targets.nas]
service = "backup.example:7000"
key = "web1.key"
identity = "web1"
warn_after = "2d"
rate_limit = "30M"

[targets.offsite]
bucket = "s3://backups/web1"
full_every = "30d"
preserve = "30d 12m"

[targets.usb]
receive = "usb"
full_every = 5
"""


def test_a_configuration_names_subvolumes_targets_and_policies(tmp_path: Path) -> None:
    config = load(write_config(tmp_path, GOOD))
    assert config.lock == DEFAULT_LOCK
    home, srv = config.subvolumes["home"], config.subvolumes["srv"]
    assert home.path == str(tmp_path / "home") and home.snapshots == str(tmp_path)
    assert home.targets == ("nas", "usb") and srv.targets == ("nas", "offsite", "usb")
    assert str(home.preserve) != str(srv.preserve) and srv.snapshots == str(tmp_path / "snaps")
    nas, offsite, usb = (config.targets[n] for n in ("nas", "offsite", "usb"))
    assert (nas.kind, nas.identity, nas.key, nas.warn_after) == ("service", "web1", bytes(range(32)), dt.timedelta(2))
    assert nas.rate_limit == 30 << 20 and config.targets["offsite"].rate_limit is None
    assert (offsite.kind, offsite.full_every, offsite.key) == ("bucket", Rotation(age=dt.timedelta(30)), None)
    assert offsite.preserve is not None and usb.place == str(tmp_path / "usb") and usb.full_every == Rotation(5)
    assert KEEP_ALL.keeps_all


@pytest.mark.parametrize(
    ("change", "line", "said"),
    [
        (('identity = "web1"', 'identity = ""'), 16, "targets.nas.identity: expected a non-empty string"),
        (('full_every = "30d"', 'full_every = "30"'), 22, "targets.offsite.full_every = '30': expected"),
        (('warn_after = "2d"', 'warn_after = "soon"'), 17, "targets.nas.warn_after = 'soon': expected an age"),
        (('targets = ["nas", "usb"]', 'targets = ["nas", "tape"]'), 6, "no target is called 'tape'"),
        (('receive = "usb"', 'receive = "nowhere"'), 26, "targets.usb.receive: "),
        (('preserve = "2d"', 'preserve = "2x"'), 11, "subvolumes.srv.preserve = '2x': expected"),
        (("[targets.usb]", "[targets.usb]\npreserve_min = 'no'"), 26, "targets.usb.preserve_min: goes with preserve"),
        (('service = "backup.example:7000"', 'service = "backup.example"'), 14, "targets.nas.service: "),
        (('key = "web1.key"', 'key = "missing.key"'), 15, "targets.nas.key: "),
        (('rate_limit = "30M"', 'rate_limit = "fast"'), 18, "targets.nas.rate_limit: expected a size in bytes above 0"),
        (("[targets.usb]", "[targets.usb]\nbucket = 's3://b/p'"), 25, "targets.usb: expected one of service"),
        (('path = "home"\ntargets', 'path = "home"\nsnapshot = "x"\ntargets'), 6, "unknown setting 'snapshot'"),
        (("[targets.nas]", "[targets.nas]\nfull_every = 3"), 14, "targets.nas: unknown setting 'full_every'"),
        (('full_every = "30d"', 'encrypt_key = "web1.key"'), 23, "targets.offsite.preserve: a bucket sealed with"),
        (('receive = "usb"', 'receive = "snaps"'), 26, "is subvolumes.srv.snapshots: a target needs a place"),
    ],
)
def test_a_wrong_configuration_names_the_file_line_and_what_was_expected(
    tmp_path: Path, change: tuple[str, str], line: int, said: str
) -> None:
    text = GOOD.replace(*change, 1)
    assert text != GOOD
    path = write_config(tmp_path, text)
    with pytest.raises(e.ConfigError) as caught:
        load(path)
    assert said in str(caught.value)
    assert caught.value.where == f"{path}:{line}", str(caught.value)
