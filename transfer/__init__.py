"""rq transfer library."""
