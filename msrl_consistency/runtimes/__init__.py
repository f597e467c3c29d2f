"""One module per inference runtime behind one contract (``base.Runtime``); ``registry`` lists them."""
