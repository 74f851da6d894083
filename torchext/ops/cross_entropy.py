"""Placeholder until this family lands."""
def cross_entropy(*a, **k): raise NotImplementedError
