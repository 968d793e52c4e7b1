"""What every part shares and nothing heavy: settings, options, events, metrics, errors, files. No torch."""
