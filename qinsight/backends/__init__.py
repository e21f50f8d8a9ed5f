"""The backends qinsight ships, each one :class:`~qinsight.core.backend.Backend` record in one file,
registered as an entry point of ``qinsight.backends`` exactly as a third party's is:

- :mod:`.x86`: FX's x86 engine, torchao's ``X86InductorQuantizer`` (PT2E), ``quantize_``'s int8
  kernels; lowered by inductor (``torch.compile`` with freezing);
- :mod:`.xnnpack`: ExecuTorch's ``XNNPACKQuantizer`` (PT2E); lowered through ExecuTorch's XNNPACK delegate;
- :mod:`.fx_engines`: FX's other engines (fbgemm, qnnpack, onednn), FX's flow alone.

A record module imports only the core: its torch side is imported when called.
"""
