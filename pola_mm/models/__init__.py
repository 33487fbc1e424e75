"""Models of pola_mm; importing this module registers them."""
