"""A Llama-style decoder for the benchmarks, defined here so the numbers do not depend on any model zoo.

RMSNorm, rotary position embedding (optional), causal attention through ``F.scaled_dot_product_attention`` with
grouped-query key/value heads, SwiGLU MLP, token embedding and an untied lm head. Presets follow the sizes in
issue 4; build them under a ``FakeTensorMode`` to get a model that allocates nothing real.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class Config:
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab: int
    rotary: bool = True
    norm_eps: float = 1e-5


PRESETS: dict[str, Config] = {
    "tiny": Config(n_layers=2, dim=256, n_heads=4, n_kv_heads=4, ffn_dim=688, vocab=32000),
    "1B": Config(n_layers=16, dim=2048, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab=32000),
    "7B": Config(n_layers=32, dim=4096, n_heads=32, n_kv_heads=32, ffn_dim=11008, vocab=32000),
    "70B": Config(n_layers=80, dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672, vocab=32000),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(head_dim: int, seq: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (batch, heads, seq, head_dim); rotate the two halves of head_dim.
    x1, x2 = x.chunk(2, dim=-1)
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q = apply_rotary(q, *rope)
            k = apply_rotary(k, *rope)
        if self.n_kv_heads != self.n_heads:
            rep = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: Config, max_seq: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        if cfg.rotary:
            cos, sin = rotary_tables(cfg.dim // cfg.n_heads, max_seq)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        rope = (self.rope_cos[:seq], self.rope_sin[:seq]) if self.cfg.rotary else None
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, rope)
        return self.lm_head(self.norm(x))


def build(preset: str, *, seq: int, batch: int = 1, dtype: torch.dtype = torch.float32) -> tuple[Decoder, torch.Tensor]:
    """Build the preset model and a batch of token ids in the current mode (call it under a FakeTensorMode for fakes).

    Fake parameters allocate nothing, so even 70B costs only Python objects; the initialisers still run (on fakes).
    """
    cfg = PRESETS[preset]
    # Set the default dtype rather than calling .to(dtype): swapping parameters is not supported on fakes.
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = Decoder(cfg, max_seq=seq)
    finally:
        torch.set_default_dtype(old)
    tokens = torch.randint(0, cfg.vocab, (batch, seq))
    return model, tokens


def n_params(preset: str) -> int:
    """Parameter count of a preset, computed from the config (no model built)."""
    c = PRESETS[preset]
    head_dim = c.dim // c.n_heads
    attn = c.dim * c.n_heads * head_dim * 2 + c.dim * c.n_kv_heads * head_dim * 2
    mlp = 3 * c.dim * c.ffn_dim
    per_layer = attn + mlp + 2 * c.dim
    return c.vocab * c.dim * 2 + c.n_layers * per_layer + c.dim


if __name__ == "__main__":
    for name in PRESETS:
        print(f"{name}: {n_params(name) / 1e9:.2f} B parameters ({math.ceil(n_params(name) * 2 / 2**30)} GiB in bf16)")
