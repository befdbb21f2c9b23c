"""The same GPT-2-shaped model and training step as bench_train_step, in PyTorch, for comparison.

Same shapes, tied embeddings, tanh GELU, causal attention, cross-entropy, AdamW (weight decay on matrices),
fp32, the same thread count. Prints one JSON line.
Usage: python3 train_step_torch.py LAYERS EMBD HEADS B T STEPS [DEVICE [PRECISION]]
DEVICE is cpu (default) or cuda; PRECISION f32 (default) or bf16 (autocast to bf16, fp32 master weights and
gradients: what H2's bf16 training keeps). scripts/gpu_check.sh runs it with cuda bf16.
"""
import contextlib
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.nh, c // self.nh).transpose(1, 2) for y in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.nh))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, c, nh, vocab=50257, seq=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq, c)
        self.h = nn.ModuleList(Block(c, nh) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    layers, c, nh, b, t, steps = (int(a) for a in sys.argv[1:7])
    device = sys.argv[7] if len(sys.argv) > 7 else "cpu"
    precision = sys.argv[8] if len(sys.argv) > 8 else "f32"
    torch.manual_seed(1)
    model = GPT(layers, c, nh).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95))
    idx = torch.randint(0, 50257, (b, t), device=device)
    tgt = torch.randint(0, 50257, (b, t), device=device)
    autocast = (torch.autocast(device_type=device, dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = model(idx, tgt)
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()

    step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    print(json.dumps({"system": f"pytorch {torch.__version__} {device} {precision}", "seconds_per_step": s,
                      "tokens_per_s": b * t / s, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
