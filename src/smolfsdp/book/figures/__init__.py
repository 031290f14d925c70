"""The book's figures: pure ``plot_*`` functions that return plotly Figures, and ``plotting.save_figure``.

``plotting`` (the shared look, the notebook renderer, ``save_figure``, loss curves and grouped bars),
``memory`` ("Where the memory goes"), ``fit_explorer`` (the interactive "does it fit?" figure),
``mechanisms`` (FSDP's mechanisms from the step probe), ``trace`` ("Reading the profiler": the timeline),
``scale`` ("Scaling out").
"""
