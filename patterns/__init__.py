"""Ready-made patterns to start from. Each module documents its inputs, outputs and streams."""
