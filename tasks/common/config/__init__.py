"""What every other room reads: where things live (settings), the framework table, the plan a command hands its flow, and errors a user can fix."""
