"""Lossless JSON and the bytes of bodies: parsing, where things are in a body without
parsing it, and bodies that extend one parsed a moment ago (parsed from where they differ)."""
