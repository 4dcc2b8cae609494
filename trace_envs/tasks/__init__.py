"""Task loaders: real data sets (read from local files) and the offline default task sets."""
