"""The runners: the loops that drive an algorithm, synchronous or asynchronous."""
