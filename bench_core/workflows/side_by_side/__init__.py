"""Side by side with another git revision: the revision's tree and its loader, and capturing a test's instance."""
