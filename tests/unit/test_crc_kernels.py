"""Every CRC-32C kernel of the native module against the reference: every length and alignment up to 4 KiB,
random lengths up to 16 MiB, chained (SENDSTREAM_CRC, which chooses one for every check:
tests/integration/test_native_cli.py). A kernel this processor lacks is skipped, saying so (machines differ
between runs); tools/sanitize.sh runs these under ASan and UBSan."""

from __future__ import annotations

import random

import pytest

from sendstream import reference_crc32c
from sendstream.codec.backend import native

NATIVE = native()
KERNELS = ("sse4.2", "vpclmulqdq", "armv8")  # besides "table", checked against the reference below
MAX_EXHAUSTIVE = 4096


def module_with(kernel: str) -> object:
    if NATIVE is None:
        pytest.skip("the native module is not built")
    if kernel not in NATIVE.module.KERNELS:
        pytest.skip(f"this processor has no {kernel} kernel (it has {', '.join(NATIVE.module.KERNELS)})")
    return NATIVE.module


def test_the_table_kernel_is_the_reference() -> None:
    module = module_with("table")
    rng = random.Random(7)
    data = rng.randbytes(70_000)
    for n in [0, 1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1023, 1024, 1025, 4096, 70_000]:
        crc = rng.getrandbits(32)
        assert module.crc32c(data[:n], crc, kernel="table") == reference_crc32c(data[:n], crc), n  # type: ignore[attr-defined]


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_length_and_alignment_up_to_4_kib(kernel: str) -> None:
    module = module_with(kernel)
    rng = random.Random(kernel)
    view = memoryview(bytearray(rng.randbytes(MAX_EXHAUSTIVE + 64)))
    crc32c = module.crc32c  # type: ignore[attr-defined]
    for align in range(64):
        for n in range(MAX_EXHAUSTIVE + 1):
            part, crc = view[align : align + n], rng.getrandbits(32)
            if crc32c(part, crc, kernel=kernel) != crc32c(part, crc, kernel="table"):
                pytest.fail(f"{kernel}: {n} bytes at alignment {align}, crc {crc:#x}: not the reference's")


@pytest.mark.parametrize("kernel", KERNELS)
def test_random_lengths_up_to_16_mib_and_chained(kernel: str) -> None:
    module = module_with(kernel)
    rng = random.Random(f"{kernel} long")
    data = memoryview(bytearray(rng.randbytes((16 << 20) + 64)))
    crc32c = module.crc32c  # type: ignore[attr-defined]
    for _ in range(40):
        n, align, crc = rng.randrange(16 << 20), rng.randrange(64), rng.getrandbits(32)
        part = data[align : align + n]
        assert crc32c(part, crc, kernel=kernel) == crc32c(part, crc, kernel="table"), (n, align)
        cut = rng.randrange(n + 1)
        chained = crc32c(part[cut:], crc32c(part[:cut], crc, kernel=kernel), kernel=kernel)
        assert chained == crc32c(part, crc, kernel="table"), (n, align, cut)
