"""Wire dialects: each translates its requests to chat-completions and replies back."""
