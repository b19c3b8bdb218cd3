"""The attention runtime behind `tlc.attention`, `torch.ops.tlc.attention` and `tlc.precompile`.

- `sdpa`: the call, in SDPA's terms: its checks, the eager call plans, the layouts the kernel reads;
- `kernels`: which kernel a call gets: the shipped spec, its tiles and schedule, the target, the fallback;
- `tuning`: the tiles and schedule knobs per head dim and target, with the measurements behind them;
- `torch_op`: the `tlc::attention` custom op that torch.compile traces;
- `shapes`, `precompile`: shape lists and `tlc precompile`, which fill the kernel cache ahead of time.

`tlc.build` (any TL program → a kernel) is `tlc.runtime`'s. The name `tlc.attention` is the function
(tlc/__init__.py binds it after importing this package), so import these modules with
`from tlc.attention import sdpa` or `from tlc.attention.sdpa import …`: `import tlc.attention.sdpa as m`
and `tlc.attention.sdpa.…` reach the function, not the package.
This module imports nothing: `import tlc` stays free of torch.
"""
