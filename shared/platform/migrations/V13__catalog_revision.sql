-- The catalog's revision: the position of the last event that changed a catalog version
-- (kept by the catalog read model in its batch transaction; 0 until one does). The command
-- service caches what a write reads from the catalog and appends with a guard that the live
-- catalog is still at the revision it read, so a cached entry is never used after a change.
ALTER TABLE projections ADD COLUMN revision bigint NOT NULL DEFAULT 0;
