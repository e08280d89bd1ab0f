-- When a projection batch's step began (its transaction's start), beside when it committed:
-- splits the projection lag into the wait for a step and the step itself.
ALTER TABLE projection_batches ADD COLUMN started_at timestamptz;
