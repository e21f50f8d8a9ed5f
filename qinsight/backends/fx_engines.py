"""FX's engines other than x86: torch's own backends, quantized by FX's flow alone (PT2E quantizes a
report for them with x86's quantizer: :attr:`~qinsight.core.flows.FlowSpec.stand_in`)."""

from __future__ import annotations

from qinsight.core.backend import Backend

FBGEMM = Backend(name="fbgemm", title="fbgemm", fx_engine="fbgemm", reduced_range=True)
QNNPACK = Backend(name="qnnpack", title="qnnpack", fx_engine="qnnpack")
ONEDNN = Backend(name="onednn", title="oneDNN", fx_engine="onednn")

__all__ = ["FBGEMM", "ONEDNN", "QNNPACK"]
