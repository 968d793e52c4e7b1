"""Thin products (a verify's K+1 rows by a weight): packed, MLAS and specview's C++ kernels (csrc/)."""
