"""Tools around the producer (the CLI's read path and topic creation): not on its path."""
