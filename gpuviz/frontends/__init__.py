"""Front-ends: CLI, IPython magics, widgets. Thin layers over the same functions."""
