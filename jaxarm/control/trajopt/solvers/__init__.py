"""One module per trajectory-optimization solver."""
