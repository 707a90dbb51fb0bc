"""Searching kernel configs: configs as DSL settings through the validator (settings), evaluated on cases
by counting and modeling (evaluate), and the two-stage tile-config search behind `imegen tune` (tune)."""
