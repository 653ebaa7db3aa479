"""`bench profile`: where an engine step's time goes, by category, against this device's peaks."""
