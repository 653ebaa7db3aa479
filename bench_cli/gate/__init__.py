"""`bench gate`: judge a run or sweep against a baseline (checks) or by ratios inside it
(ratio), from the files it wrote (results)."""
