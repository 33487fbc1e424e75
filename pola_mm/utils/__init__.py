"""Small helpers of pola_mm that need only numpy and PIL."""
