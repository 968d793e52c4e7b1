"""One widget per file; intrinsic styles in each DEFAULT_CSS, layout in ../specview.tcss."""
