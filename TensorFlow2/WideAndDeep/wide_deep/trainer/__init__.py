"""Wide & Deep training: arguments, model, schedule, Merlin data loading, exact evaluation, the run loop."""
