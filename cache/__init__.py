"""rq cache library."""
