-- +goose Up
-- Where the controller holding the lease serves gRPC, so another replica can
-- forward steering and runtime-request resolutions to the live session.
ALTER TABLE executor.coordinators ADD COLUMN controller_addr text;

-- +goose Down
ALTER TABLE executor.coordinators DROP COLUMN controller_addr;
