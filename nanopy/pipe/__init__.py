"""The pipe side: one driver per connection (writer, reader, liveness, outbox) and its host seam."""
