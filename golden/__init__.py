"""Bit-exact numpy models of every hardware unit (the specification), plus float references."""
