"""The accounting role: finished job attempts and their timelines, recorded once."""
