"""Pure statistics: windowed quantiles and error rates, rates and ETAs, survival curves (no I/O)."""
