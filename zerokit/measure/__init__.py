"""Layer 5 (beside report): the live-tensor-byte meter, tracing, the local-rank harness, micro-benchmarks, calibration fits.

A side room that writes hardware profiles; estimation reads them only through zerokit.spec.profile."""
