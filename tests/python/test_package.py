"""The package's own helpers: bf16 conversions, the decorator's checks, load_dump."""

from __future__ import annotations

import numpy as np
import pytest

import mlafuzz
from conftest import NUMPY_KERNEL, SMALL_CASE, describe, mlafuzz_cmd


def test_bf16_round_trip_and_round_to_nearest_even() -> None:
    bits = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = (bits & 0x7F80) != 0x7F80
    back = mlafuzz.float32_to_bf16(mlafuzz.bf16_to_float32(bits))
    assert np.array_equal(back[finite], bits[finite])
    # 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to the even one (1.0);
    # 1 + 3 * 2^-8 goes up to the even 1.015625.
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20], dtype=np.float32)
    assert mlafuzz.float32_to_bf16(x).tolist() == [0x3F80, 0x3F82, 0x3F81]
    nan = mlafuzz.float32_to_bf16(np.array([np.nan], dtype=np.float32))[0]
    assert (nan & 0x7F80) == 0x7F80 and (nan & 0x7F) != 0


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "bad name"}, "use letters, digits"),
    ({"name": "k", "precision": "fp16"}, "use 'bf16_mma', 'fp32_simt'"),
    ({"name": "k", "device": "tpu"}, "use 'cpu' or 'cuda'"),
])
def test_kernel_decorator_rejects_bad_declarations(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        mlafuzz.kernel(**kwargs)


def test_tolerance_needs_a_positive_bound() -> None:
    with pytest.raises(ValueError, match="not both 0"):
        mlafuzz.Tolerance(abs=0, rel=0)
    info = mlafuzz.kernel(name="k", precision=mlafuzz.Tolerance(abs=1e-3, rel=0))(
        lambda call: None).__mlafuzz_kernel__
    assert (info.precision, info.abs_tol, info.rel_tol) == ("custom", 1e-3, 0.0)


def test_load_dump_returns_inputs_outputs_and_params(tmp_path) -> None:
    backend = f"{NUMPY_KERNEL}:decode"
    proc = mlafuzz_cmd("run", "--case", SMALL_CASE, "--backends", backend, "--dump", str(tmp_path))
    assert proc.returncode == 0, describe(proc)
    dump = mlafuzz.load_dump(tmp_path)
    p = dump.params
    b, h = p["batch"], p["heads"]
    assert dump["q"].dtype == np.uint16 and dump["q"].shape == (b, h, p["q_head_stride"])
    assert dump["kv_cache"].dtype == np.uint8 and dump["indices"].shape == (b, p["topk"])
    assert dump["sink"].shape == (h,) and dump["lse64"].dtype == np.float64
    ours = [k for k in dump.arrays if k.startswith("out_python")]
    assert len(ours) == 1, sorted(dump.arrays)
    assert np.allclose(dump[ours[0]], dump["out64"], atol=2e-2), "python kernel vs oracle"


def test_load_dump_names_the_fix_for_a_missing_folder(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="mlafuzz run --case CASE.json --dump"):
        mlafuzz.load_dump(tmp_path / "nothing")


def test_envelope_serializes_every_kind_of_integer_set() -> None:
    env = mlafuzz.Envelope(layouts=["model1"], nope_dim=448, heads=range(1, 65),
                           topk=mlafuzz.Multiple(64, max=512), page_size=range(16, 257, 16),
                           batch=range(3, 20, 7), sink_in_lse=[False], refuses=["sink"])
    assert env.to_json() == {
        "format": "mlafuzz-envelope", "version": 1, "layouts": ["model1"],
        "nope_dim": {"values": [448]}, "page_size": {"min": 16, "max": 256, "multiple_of": 16},
        "batch": {"values": [3, 10, 17]}, "heads": {"min": 1, "max": 64},
        "topk": {"multiple_of": 64, "max": 512}, "sink_in_lse": [False], "refuses": ["sink"],
    }
    info = mlafuzz.kernel(name="k", envelope=env, inexact=["batch"])(
        lambda call: None).__mlafuzz_kernel__
    assert info.envelope == env.to_json() and info.inexact == ("batch",)


@pytest.mark.parametrize("kwargs, match", [
    ({"layouts": ["model2"]}, "unknown 'model2'"),
    ({"heads": []}, "a list of 1 to 16 values"),
    ({"topk": mlafuzz.Multiple(0)}, "needs of >= 1"),
    ({"refuses": ["sinks"]}, "unknown 'sinks'"),
    ({"sink_in_lse": [0]}, "a list of booleans"),
])
def test_envelope_rejects_bad_fields(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        mlafuzz.kernel(name="k", envelope=mlafuzz.Envelope(**kwargs))


def test_extra_pipeline_defaults_to_joint_and_is_checked() -> None:
    joint = mlafuzz.kernel(name="k")(lambda call: None).__mlafuzz_kernel__
    merged = mlafuzz.kernel(name="k", extra_pipeline="lse_merged")(
        lambda call: None).__mlafuzz_kernel__
    assert joint.extra_pipeline == "joint" and merged.extra_pipeline == "lse_merged"
    with pytest.raises(ValueError, match="use 'joint' or 'lse_merged'"):
        mlafuzz.kernel(name="k", extra_pipeline="merged")


def test_token_tile_defaults_to_the_precisions_and_is_checked() -> None:
    default = mlafuzz.kernel(name="k")(lambda call: None).__mlafuzz_kernel__
    tiled = mlafuzz.kernel(name="k", token_tile=16)(lambda call: None).__mlafuzz_kernel__
    assert default.token_tile == 0 and tiled.token_tile == 16
    for bad in (-1, 1.5, True, "32"):
        with pytest.raises(ValueError, match="token_tile"):
            mlafuzz.kernel(name="k", token_tile=bad)


def test_unknown_inexact_invariant_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown invariant"):
        mlafuzz.kernel(name="k", inexact=["batches"])
