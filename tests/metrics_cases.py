"""Hand-made rounds shared by the metrics and bench tests."""
from jetflow.engine.decode import Round
from jetflow.engine.tree import Tree


def rnd(tokens, parents, path, committed) -> Round:
    return Round(Tree.from_lists(tokens, parents), path, committed, [0] * len(tokens), 0.0, 0.0)


HAND_ROUNDS = [
    rnd([5, 6, 7, 8], [-1, 0, 1, 2], [0, 1, 2], [6, 7, 9]),  # chain, depths 1-2 accepted, 3 rejected
    rnd([5, 6, 7, 8], [-1, 0, 1, 2], [0], [4]),              # chain, depth 1 rejected
    rnd([5, 6, 7, 8], [-1, 0, 0, 2], [0, 1], [6, 3]),        # accepted node 1 has no child: no depth-2 chance
    rnd([5], [-1], [0], [6]),                                # AR round: no chance at all
]
