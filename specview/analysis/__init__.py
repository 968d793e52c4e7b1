"""Reading runs: roofline, diagnosis, what-if replay, cost curves (calibrate) and `check`."""
