"""Widgets: notebook components built from views (ipywidgets, plotly FigureWidget)."""
