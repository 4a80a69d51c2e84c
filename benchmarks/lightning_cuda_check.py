"""Lightning on CUDA through `strategy="mccl"` (tensors staged through host memory) against NCCL DDP.

    python benchmarks/lightning_cuda_check.py train DIR ddp  [--devices 2]   # Lightning DDP over NCCL
    python benchmarks/lightning_cuda_check.py train DIR mccl [--devices 2]   # the same with strategy="mccl"
    python benchmarks/lightning_cuda_check.py compare DIR                    # writes DIR/lightning_cuda.json

Trains the same small model with Trainer(accelerator="cuda", strategy=S) in separate runs, then compares
the final weights (2 ranks: one addition per element, so they must agree to 1e-6).
Needs CUDA devices; this is what the GPU machine runs for the README's "verified on" line.
"""
from __future__ import annotations

import json
import sys

import lightning_mccl  # noqa: F401  (registers the backend and the "mccl" strategy)
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train(strategy: str, devices: int) -> dict:
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(256, 32, generator=g), torch.randint(0, 4, (256,), generator=g))
    model = Net()
    trainer = L.Trainer(accelerator="cuda", devices=devices, strategy=strategy, max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        deterministic=True)
    trainer.fit(model, DataLoader(data, batch_size=16, shuffle=False))
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
    return {"rank": trainer.global_rank, "backend": backend,
            "state": {k: v.detach().double().cpu() for k, v in model.state_dict().items()}}


def main() -> None:
    mode, out_dir = sys.argv[1], sys.argv[2]
    if mode == "train":
        strategy = sys.argv[3]
        devices = int(sys.argv[sys.argv.index("--devices") + 1]) if "--devices" in sys.argv else 2
        result = train(strategy, devices)
        if result["rank"] == 0:
            torch.save(result, f"{out_dir}/{strategy}.pt")
        return
    mccl, ref = torch.load(f"{out_dir}/mccl.pt"), torch.load(f"{out_dir}/ddp.pt")
    diffs = {k: float((mccl["state"][k] - ref["state"][k]).abs().max()) for k in ref["state"]}
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "backends": [mccl["backend"], ref["backend"]], "max_abs_diff_vs_nccl_ddp": diffs,
              "ok": max(diffs.values()) <= 1e-6 and mccl["backend"] == "mccl" and ref["backend"] == "nccl"}
    with open(f"{out_dir}/lightning_cuda.json", "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    if not result["ok"]:
        raise SystemExit("mccl and NCCL DDP disagree")


if __name__ == "__main__":
    main()
