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
    prompts = {int(g) for g in np.flatnonzero(np.asarray(seg).reshape(-1, 4)[:, 3] == 0)}  # segments without context

    def block0_positions(tiles):
        return [i for i, t in enumerate(tiles.tolist()) if t[0] in prompts and t[1] == 0]

    heaviest = launch_order(key_tiles(seg, BLOCK_KEYS, True), seg)
    node = launch_order(key_tiles(seg, BLOCK_KEYS, True), seg, node_major_tiles=True)
    first = block0_positions(heaviest)
    assert len(first) == 4 and np.all(np.diff(first) == 1)    # block 0 of the four prompts, one after another
    assert np.all(np.diff(block0_positions(node)) == 64)     # node-major: each prompt's 64 blocks in a row
    assert np.array_equal(np.sort(node, axis=0), np.sort(heaviest, axis=0))


def test_bit_comparison_flags_what_no_order_may_change():
    def row(layout, sums):
        return {"layout": layout, "grad_sha256": list(sums), "finite": True, "median_ms": 1.0}

    base = {"setting": "heaviest", "tree_dq_order": "nearest", "rows": [row("4x8K", "abc"), row("tree-a", "def")]}
    root = {"setting": "node+root", "tree_dq_order": "root", "rows": [row("4x8K", "abc"), row("tree-a", "Xef")]}
    assert order_bench.compare_bits([base, root]) == []     # a tree's dQ may differ under another tree dQ order
    wrong = {"setting": "node", "tree_dq_order": "nearest", "rows": [row("4x8K", "aYc"), row("tree-a", "Xef")]}
    assert order_bench.compare_bits([base, wrong]) == ["node 4x8K: dk differs from heaviest's",
                                                       "node tree-a: dq differs from heaviest's"]


def test_empty_settings_are_refused(monkeypatch, capsys):
    monkeypatch.setattr(order_bench.torch.cuda, "is_available", lambda: True)  # reach the argument check
    with pytest.raises(SystemExit):
        order_bench.main(["--settings", ","])
    assert "no settings" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU refusal")
def test_refuses_without_cuda(capsys):
    assert order_bench.main(["--settings", "heaviest"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
