# Builds the service for docker-compose.yml.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /stock ./cmd/stock

FROM gcr.io/distroless/static-debian12
COPY --from=build /stock /stock
EXPOSE 8080
ENTRYPOINT ["/stock"]
