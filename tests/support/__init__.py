"""What the tests share, and no test of its own.

``streams`` the fixtures and crafted streams, ``btrfs`` the real btrfs-progs,
``loopfs`` throw-away loop-device btrfs filesystems (the generators of tools/
use it too), ``trees`` the state of extracted trees and what differs between two,
``differential`` the kernel differential campaign (tools/differential.py runs it
long), ``strategies`` Hypothesis
strategies, ``net`` ports and the CLI's processes, ``proxy`` the
fault-injecting TCP proxy, ``tls`` TLS channels and real TLS peers.
"""
