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
