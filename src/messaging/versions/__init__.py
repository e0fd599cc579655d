"""Versions of a consumer: declarations, versions built beside the live one, the cutover,
retired versions and their tables."""
