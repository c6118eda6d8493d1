"""Speculative decoding: proposers (a registry behind one interface) and their verification."""
