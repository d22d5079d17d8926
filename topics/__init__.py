"""rq topics library."""
