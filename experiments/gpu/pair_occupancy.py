"""How many CTAs of the warp-specialised backward run at once on this GPU, one per CTA or in CTA pairs (clusters of
two, DKV_DQ_PAIRS): cuda.core's occupancy queries for each head dim, printed and written as JSON.

    python experiments/gpu/pair_occupancy.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    from cuda.core import Device, LaunchConfig

    from dualkv.cuda.configs import ws_bwd_spec
    from dualkv.cuda.runtime import device_context, get_kernel

    rows = []
    with device_context(0):
        stream = Device(0).default_stream
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for head_dim in (64, 96, 128):
            for pairs in (False, True):
                spec = ws_bwd_spec(head_dim, torch.bfloat16, dq_pairs=pairs)
                kern = get_kernel(spec, 0).kernel
                row = {"head_dim": head_dim, "pairs": pairs, "smem": spec.smem_bytes, "sms": sms}
                try:
                    row["blocks_per_sm"] = kern.occupancy.max_active_blocks_per_multiprocessor(spec.threads,
                                                                                           spec.smem_bytes)
                    config = LaunchConfig(grid=(2 * sms, 1, 1), block=(spec.threads, 1, 1),
                                          shmem_size=spec.smem_bytes, **({"cluster": (2, 1, 1)} if pairs else {}))
                    if pairs:
                        row["max_active_clusters"] = kern.occupancy.max_active_clusters(config, stream=stream)
                except Exception as err:  # report, do not raise
                    row["error"] = repr(err)[:300]
                rows.append(row)
                print(json.dumps(row), flush=True)
    Path(args.out, "pair_occupancy.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
