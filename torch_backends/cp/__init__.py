"""The torch context-parallel strategies, one module each (libraries.py: those
of established libraries); base.py holds what they share."""
