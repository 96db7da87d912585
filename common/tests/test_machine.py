import socket

import pytest

from recsys_common.machine import cpu_bf16_instructions, cpu_model_name, free_port


def test_cpu_model_name_is_procfs_model_name():
    try:
        with open("/proc/cpuinfo") as f:
            expected = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        expected = None
    name = cpu_model_name()
    assert name and "\n" not in name
    if expected is not None:
        assert name == expected


def test_free_port_can_be_bound_on_loopback():
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.parametrize("flags, expected", [("fpu avx512f avx512_bf16 amx_bf16 amx_tile", "amx"),
                                             ("fpu avx512f avx512_bf16", "avx512_bf16"),
                                             ("fpu avx2 avx512f", "none")])
def test_cpu_bf16_instructions_read_the_flags(tmp_path, flags, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: X\nflags\t\t: {flags}\n\n")
    assert cpu_bf16_instructions(str(cpuinfo)) == expected
    assert cpu_bf16_instructions(str(tmp_path / "absent")) == "unknown"


def test_glibc_malloc_options_accepted_here_and_refused_without_glibc(monkeypatch):
    """On this glibc Linux the options are accepted (mallopt returns 1); where libc.so.6 cannot be loaded (musl,
    another OS) the answer is False, not an exception."""
    import ctypes
    import sys
    from recsys_common.machine import glibc_malloc_options
    if sys.platform.startswith("linux"):
        assert glibc_malloc_options(mmap_threshold=32 << 20, trim_threshold=1 << 30) is True
        assert glibc_malloc_options() is True   # nothing asked

    def no_glibc(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")
    monkeypatch.setattr(ctypes, "CDLL", no_glibc)
    assert glibc_malloc_options(mmap_max=0, trim_threshold=-1) is False
