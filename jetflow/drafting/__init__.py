"""What proposes a tree: the draft head and its checkpoint format, tree builders, prompt lookup,
the path correction, the acceptance profile and verify-cost curve that builders read, every proposer, and the
method registry that turns a method name into a proposer (``methods.make_proposer``).

May import: ``engine``, ``util``.
Never: ``data``, ``training``, ``evaluation``, ``views``, ``results``, the top.
"""
