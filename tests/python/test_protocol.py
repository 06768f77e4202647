"""The RUN request of worker protocol 3 (docs/WORKER_PROTOCOL.md): a layout line parsed once while
it repeats, a call line parsed every time, arena descriptors relative to the buffer the call line
places. The end-to-end path (the executable's requests) is covered by every test that runs a
python: backend; these pin the worker's side of the memo.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import shutil
import types

import numpy as np
import pytest

from conftest import NUMPY_KERNEL, ROOT, describe, mlafuzz_cmd
from mlafuzz.worker import protocol, server


def layout(batch: int = 2) -> dict:
    return {
        "layout": "model1", "nope_dim": 448, "rope_dim": 64, "scale_tile": 64, "page_size": 64,
        "num_pages": 4, "page_stride": 64 * 656, "kv_cache_bytes": 4 * 64 * 656,
        "token_bytes": 656, "d_qk": 512, "d_v": 448, "invalid_index_rule": "minus_one_only",
        "empty_row_lse": "+inf", "sink_in_lse": False, "batch": batch, "heads": 1, "topk": 4,
        "sm_scale": 0.0625, "q_head_stride": 512, "q_batch_stride": 512,
        "indices_batch_stride": 4, "out_head_stride": 448, "out_batch_stride": 448,
        "lse_batch_stride": 1, "has_topk_length": False, "has_sink": False,
        "arrays": {
            "indices_raw": [0, [batch * 4], [4], "i4", "arena", "indices_raw"],
            "indices": [0, [batch, 4], [16, 4], "i4", "arena", "indices_raw"],
            "lse_raw": [64, [batch], [4], "f4", "shm"],
        },
        "out_guard": 0, "lse_guard": 0,
    }


def payload(lay: dict, call: dict) -> bytes:
    return (json.dumps(lay, separators=(",", ":")) + "\n" + json.dumps(call)).encode()


def test_the_layout_line_is_parsed_once_while_it_repeats() -> None:
    lay = layout()
    req, first, memo = protocol.parse_run(payload(lay, {"shm_size": 4096}), None)
    assert req["batch"] == 2 and req["shm_size"] == 4096 and first.fields["sm_scale"] == 0.0625
    req2, again, memo2 = protocol.parse_run(payload(lay, {"shm_size": 8192, "ids": {"q": 1}}), memo)
    assert again is first  # the same bytes: not parsed again
    assert req2["shm_size"] == 8192 and req2["ids"] == {"q": 1}
    assert "ids" not in first.req  # the call line never leaks into the kept layout
    req3, other, _ = protocol.parse_run(payload(layout(batch=3), {"shm_size": 8192}), memo2)
    assert other is not first and req3["batch"] == 3 and other.fields["batch"] == 3


def test_a_single_line_request_is_parsed_whole_and_not_kept() -> None:
    lay = layout()
    lay["shm_size"] = 4096
    req, parsed, memo = protocol.parse_run(json.dumps(lay).encode(), None)
    assert req["shm_size"] == 4096 and parsed.fields["topk"] == 4 and memo is None


class _Info:
    device = "cpu"


@pytest.mark.parametrize("base", [0, 128, 4000])
def test_arena_descriptors_are_placed_by_the_call_lines_bases(base: int) -> None:
    arena = mmap.mmap(-1, 8192)
    rows = np.arange(8, dtype=np.int32) + base
    arena[base:base + rows.nbytes] = rows.tobytes()
    shm = mmap.mmap(-1, 4096)
    s = object.__new__(server.Server)
    s.shm = types.SimpleNamespace(ensure=lambda size: shm)
    s.arena = types.SimpleNamespace(ensure=lambda size: arena)
    s.info = _Info()
    seen = {}
    s._run_cpu = lambda call, a: seen.update(a) or {"status": "ok", "message": "", "seconds": 0}
    req, lay, _ = protocol.parse_run(payload(layout(), {"shm_size": 4096,
                                                        "bases": {"indices_raw": base}}), None)
    s.run_reply(req, lay)
    assert seen["indices"].tolist() == [list(rows[:4]), list(rows[4:])]
    assert seen["indices_raw"].tolist() == list(rows)
    assert not seen["indices"].flags.writeable and seen["lse_raw"].flags.writeable


def test_the_ok_reply_is_the_bytes_json_would_write() -> None:
    r, w = os.pipe()
    try:
        for seconds in (0.0, 1.25e-05, 3.0):
            protocol._send_run_reply(w, {"status": "ok", "message": "", "seconds": seconds})
            kind, body = protocol.read_frame(r)
            assert kind == protocol.MSG_RUN
            assert body == json.dumps({"status": "ok", "message": "", "seconds": seconds}).encode()
        protocol._send_run_reply(w, {"status": "error", "message": "boom", "seconds": 1.0})
        assert json.loads(protocol.read_frame(r)[1])["message"] == "boom"
    finally:
        os.close(r)
        os.close(w)


def test_a_cuda_worker_keeps_its_numpy_views_while_place_and_mapping_stay() -> None:
    arena, shm = mmap.mmap(-1, 8192), mmap.mmap(-1, 4096)
    rows = np.arange(2048, dtype=np.int32)
    arena[:] = rows.tobytes()
    maps = {"shm": shm}
    s = object.__new__(server.Server)
    s.shm = types.SimpleNamespace(ensure=lambda size: maps["shm"])
    s.arena = types.SimpleNamespace(ensure=lambda size: arena)
    s.info = types.SimpleNamespace(device="cuda")
    s.host_arrays = {}
    s._register_shm = lambda region: None
    seen: list = []
    s._run_cuda = lambda call, a, req: seen.append(dict(a)) or {"status": "ok"}
    lay = layout()

    def run(base: int) -> dict:
        req, parsed, _ = protocol.parse_run(payload(lay, {"shm_size": 4096,
                                                          "bases": {"indices_raw": base}}), None)
        s.run_reply(req, parsed)
        return seen[-1]

    first = run(64)
    assert "indices" not in first  # a host view a cuda call never reads
    assert first["indices_raw"].tolist() == list(range(16, 24))
    again = run(64)
    # parse_run without a memo parses again: a new layout entry, so new views
    assert again["indices_raw"] is not first["indices_raw"]
    req, parsed, _ = protocol.parse_run(payload(lay, {"shm_size": 4096,
                                                      "bases": {"indices_raw": 64}}), None)
    s.run_reply(req, parsed)
    kept = seen[-1]["indices_raw"]
    s.run_reply(dict(req), parsed)
    assert seen[-1]["indices_raw"] is kept, "the same entry, offset and mapping: kept"
    req["bases"] = {"indices_raw": 128}
    s.run_reply(req, parsed)
    moved = seen[-1]["indices_raw"]
    assert moved is not kept and moved.tolist() == list(range(32, 40))
    maps["shm"] = mmap.mmap(-1, 8192)  # fd 3 mapped again: every kept view goes
    s.run_reply(req, parsed)
    assert seen[-1]["lse_raw"] is not seen[-2]["lse_raw"]
    assert seen[-1]["indices_raw"] is not moved


def copied_package(tmp_path, monkeypatch):
    """A copy of the mlafuzz package under tmp_path, which the workers then import."""
    old = tmp_path / "mlafuzz"
    shutil.copytree(os.path.join(ROOT, "python", "mlafuzz"), old,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("MLAFUZZ_PYTHON_PACKAGE_DIR", str(tmp_path))
    return old


def test_a_package_of_the_previous_protocol_is_refused_naming_the_fix(
        tmp_path, monkeypatch) -> None:
    """An installed package older than the executable (protocol 2) is a clear error, exit 2:
    the layout line would otherwise be read as a one-line request without its call line."""
    old = copied_package(tmp_path, monkeypatch)
    init = old / "__init__.py"
    text = init.read_text()
    assert "PROTOCOL_VERSION = 3" in text
    init.write_text(text.replace("PROTOCOL_VERSION = 3", "PROTOCOL_VERSION = 2"))
    proc = mlafuzz_cmd("plugin-info", f"{NUMPY_KERNEL}:decode")
    assert proc.returncode == 2, describe(proc)
    assert "mlafuzz speaks worker protocol 3" in proc.stdout, describe(proc)
    assert "speaks 2" in proc.stdout and "pip install ./python" in proc.stdout, describe(proc)


def test_an_info_reply_without_token_tile_means_the_precisions_tile(tmp_path, monkeypatch
                                                                    ) -> None:
    """A package of the same protocol that predates token_tile (its INFO has no such field)
    still loads, and its kernels get the precision's default tile."""
    old = copied_package(tmp_path, monkeypatch)
    worker = old / "worker" / "server.py"
    text = worker.read_text()
    assert '"token_tile": i.token_tile,' in text
    worker.write_text(text.replace('"token_tile": i.token_tile,', ""))
    proc = mlafuzz_cmd("plugin-info", f"{NUMPY_KERNEL}:decode")
    assert proc.returncode == 0, describe(proc)
    assert "token tile:  the precision's default" in proc.stdout, describe(proc)


def documented_info_keys() -> list:
    """The INFO reply's fields as docs/WORKER_PROTOCOL.md's frame table lists them."""
    with open(os.path.join(ROOT, "docs", "WORKER_PROTOCOL.md"), encoding="utf-8") as f:
        (row,) = [line for line in f if line.startswith("| 1 INFO |")]
    reply = row.split("|")[3]
    return [k for k in re.findall(r"`([a-z_]+)`", reply.split("INFO:", 1)[1])
            if k not in ("bf16_mma", "fp32_simt", "custom", "cpu", "cuda")]


def test_the_info_reply_sends_the_documented_fields_in_their_order() -> None:
    """What the package sends is what the contract page lists (mlafuzz reads these keys through
    one field table, python_info.cc, whose test checks the same list)."""
    kernels = os.path.join(ROOT, "tests", "python", "envelope_kernels.py")
    s = server.Server(kernels + ":decode_tile8", shm_fd=-1, reply_fd=-1)
    assert list(s.info_reply()) == documented_info_keys()


def patched_info_reply(old, fields: str) -> None:
    """Merges `fields` (Python source of a dict) into the INFO reply of the worker of the
    package copy `old` (copied_package)."""
    with open(old / "worker" / "server.py", "a", encoding="utf-8") as f:
        f.write("\n\n_info_reply = Server.info_reply\n"
                f"Server.info_reply = lambda self: {{**_info_reply(self), **{fields}}}\n")


def test_an_info_field_of_a_newer_package_is_ignored(tmp_path, monkeypatch) -> None:
    """Fields are added to the INFO reply within a protocol version (docs/WORKER_PROTOCOL.md):
    one this mlafuzz does not know changes nothing."""
    old = copied_package(tmp_path, monkeypatch)
    before = mlafuzz_cmd("plugin-info", f"{NUMPY_KERNEL}:decode")
    assert before.returncode == 0, describe(before)
    patched_info_reply(old, '{"later": {"x": [1]}}')
    proc = mlafuzz_cmd("plugin-info", f"{NUMPY_KERNEL}:decode")
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout == before.stdout, describe(proc)


@pytest.mark.parametrize("fields, message", [
    ('{"precision": "fp16"}',
     "info.precision: unknown value 'fp16' (known: bf16_mma, fp32_simt, custom)"),
    ('{"token_tile": -8}', "info.token_tile: expected a number of tokens from 0"),
    ('{"inexact": ["batch", "rows"]}', "info.inexact: unknown invariant 'rows'"),
    ('{"available": "yes"}', "info.available: expected true or false"),
    ('{"mutants": {"off-by-one": None}}', "info.mutants.off-by-one: expected a string"),
])
def test_a_malformed_info_field_is_refused_naming_it(tmp_path, monkeypatch, fields,
                                                     message) -> None:
    patched_info_reply(copied_package(tmp_path, monkeypatch), fields)
    proc = mlafuzz_cmd("plugin-info", f"{NUMPY_KERNEL}:decode")
    assert proc.returncode == 2, describe(proc)
    assert "malformed info from the worker: " + message in proc.stdout, describe(proc)
