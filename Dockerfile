# Builds the service for docker-compose.yml.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /stock ./cmd/stock

FROM gcr.io/distroless/static-debian12
COPY --from=build /stock /stock
# distroless's "nonroot" user, numeric so that a runtime enforcing
# runAsNonRoot can check it. The service needs no privilege: it listens on
# 8080 and writes nothing to disk.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/stock"]
