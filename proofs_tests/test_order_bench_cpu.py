"""experiments/gpu/order_bench.py on the CPU: its settings are values the configuration accepts, its layouts build
(the multi-group micro-batches whose heaviest-first table interleaves prompt blocks), and without CUDA it refuses
with a message instead of running."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "gpu"))
import order_bench  # noqa: E402

from dualkv.cuda import configs  # noqa: E402


def test_settings_are_accepted_values(monkeypatch):
    for env in order_bench.SETTINGS.values():
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert configs._key_tile_order_from_env() in configs.KEY_TILE_ORDERS
        assert configs._tree_dq_order_from_env() in configs.TREE_DQ_ORDERS


def test_layouts_build_and_interleave_under_the_default_order():
    import numpy as np

    from dualkv.cuda.schedule import key_tiles
    from dualkv.cuda.ws_schedule import BLOCK_KEYS, launch_order

    got = order_bench.layouts()
    assert got["4x8K"].total_tokens == 4 * (8192 + 8 * 2048) and got["tree-a"].num_nodes == 73
    seg = got["4x8K"].segment_table
    shared = [t for t in launch_order(key_tiles(seg, BLOCK_KEYS, True), seg).tolist() if t[1] == 0][-4:]
    assert len({t[0] for t in shared}) == 4          # block 0 of the four prompts, one after another
    node = launch_order(key_tiles(seg, BLOCK_KEYS, True), seg, node_major_tiles=True)
    assert np.array_equal(np.sort(node, axis=0), np.sort(launch_order(key_tiles(seg, BLOCK_KEYS, True), seg), axis=0))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU refusal")
def test_refuses_without_cuda(capsys):
    assert order_bench.main(["--settings", "heaviest"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
