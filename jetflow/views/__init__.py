"""Pictures of rows and records for the notebooks: plotly figures of trees, rounds and rows, the
walkthrough of one round, the tree explorer widget and the notebooks' first call.

May import: ``evaluation``, ``drafting``, ``data``, ``engine``, ``util``.
Never: ``training``, ``results``, the top.
"""
